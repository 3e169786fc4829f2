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
- model usage: one count, so the timeline's action lines, the per-action table and the
  total cannot disagree. Each gateway event (a paid or reused answer, a retry, a re-ask)
  is counted once, on the line of the action it belongs to, and that line's action row
  and the total get the same usage. A paid answer whose event was lost (the process died
  between journaling the answer and its event) is counted from the `answers` table, on
  the line of the action that was running when it was journaled. A react role's state
  choice happens outside any action: it is counted on the line of the action it names
  in that round (else the role's last line of the round). Journals of older versions hold
  one `LLMCalled` summary per call instead: read the same way.

`read_exchanges` gives the whole exchange of a run (`sopctl show --prompts`, the HTML
report): every model request's messages as sent, with its answer, and every question put
to a person with the person's answer, in the order they were journaled.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import JournalError, UsageError
from engine.journal.codec import AnswerRow, EventRow, decode_event
from engine.journal.run_folder import JOURNAL_DIR, JOURNAL_FILE, writer_active
from engine.journal.sqlite_errors import naming
from engine.journal.reader import JournalReader
from engine.models.types import Usage
from engine.run.events import (
    ActionCompleted,
    ActionStarted,
    AnswerRejected,
    MessagePublished,
    ModelAnswered,
    ModelEvent,
    ModelRetried,
    PersonAnswered,
    PersonTold,
    QuestionAsked,
    RoundStarted,
    RunEnded,
    RunStarted,
    RunStatus,
    ToolCalled,
)
from engine.run.people import PERSON
from engine.run.toolloop import TOOL

__all__ = ["ActionStats", "ActionRecord", "Invocation", "ToolCallRecord", "RunState", "Exchange",
           "read_run", "rebuild",
           "find_runs", "list_runs", "read_exchanges", "exchanges_of"]


@dataclass
class ActionStats:
    """Model usage of one action id over the whole run: paid answers, reuses, retries, re-asks."""

    action: str
    roles: list[str] = field(default_factory=list)
    runs: int = 0                  # times started, over all invocations
    completed: int = 0             # distinct idempotency keys completed
    usage: Usage = Usage()


@dataclass
class ToolCallRecord:
    """One command of a tool loop (a `ToolCalled` event), for the report's own row of it."""

    step: int
    tool: str
    args: dict[str, Any]
    output: str
    error: bool
    reused: bool
    seconds: float
    ended_at: float                # wall time of its event (it started `seconds` before)


@dataclass
class ActionRecord:
    """One try of an action in the timeline: its idempotency key, in one invocation. A try
    that an invocation left unfinished (the run failed, stopped or was killed there) keeps
    its own line when a resume runs the action again: the resume's try is a new line."""

    round: int
    role: str
    action: str
    key: str
    completed: bool = False
    usage: Usage = Usage()         # what its gateway events report
    started_at: float = 0.0        # wall time of its ActionStarted
    ended_at: float | None = None  # wall time of its first ActionCompleted
    calls: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) wall times of its paid model answers: the calls in flight."""
    problems: list[str] = field(default_factory=list)
    """Retries' causes and rejected answers' errors, in order."""
    invocation: int = 1            # the invocation (1 = the first run, 2.. = resumes) of this try
    stopped_at: float | None = None
    """An unfinished try of an earlier invocation: when that invocation stopped."""
    error: str = ""                # an unfinished try's: how its invocation ended (its error)
    models: list[str] = field(default_factory=list)   # the models that answered it
    tools: list[ToolCallRecord] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    """The journal keys (request hashes) of the answers it read, paid or reused, in order."""


@dataclass
class Invocation:
    """One invocation of the run (the first `run`, then each `resume`): when it ran, how it
    ended. `ended_at` is None for one that recorded no end (killed): `last_at` is its last event."""

    number: int
    started_at: float
    model: str
    last_at: float = 0.0
    ended_at: float | None = None
    status: RunStatus = RunStatus.INTERRUPTED
    error: str = ""
    rounds: int = 0


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
    round_started: dict[int, float] = field(default_factory=dict)  # round -> first start time
    invocation_starts: list[float] = field(default_factory=list)   # each RunStarted's time
    last_event_at: float = 0.0     # the journal's last event: where an unended run stopped
    sop_path: str = ""             # the SOP file's absolute path, as the journal remembers it
    include_dirs: list[str] = field(default_factory=list)          # the run's --include-path
    shared: dict[str, Any] = field(default_factory=dict)
    """The shared state (`state:`) at the last invocation's end (RunEnded); empty when the
    file declares none, or the run never ended."""
    invocation_list: list[Invocation] = field(default_factory=list)
    """Every invocation in order, with how it ended (a resumed run's earlier failures too)."""
    models: dict[str, int] = field(default_factory=dict)
    """Each model that answered (paid or reused) and how many answers it gave."""
    rejections: dict[tuple[str, int], bool] = field(default_factory=dict)
    """(idempotency key, attempt) of each rejected answer, and whether it was asked again: a
    resume rejects again the invalid answers it reuses, which are counted once."""

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
    with JournalReader.open(run_dir) as journal, naming(journal.path):
        state = rebuild(journal.events(), run_dir=str(run_dir), answers=journal.answers())
        _add_meta(state, journal.meta())
        _mark_live(state, run_dir)
    return state


def rebuild(rows: list[EventRow], *, run_dir: str = "",
            answers: Sequence[AnswerRow] = ()) -> RunState:
    """The run's final state from its events in order and its journaled answers (see the
    module docstring)."""
    people = sum(1 for answer in answers if answer.origin == PERSON)  # neither paid nor a call
    tools = sum(1 for answer in answers if answer.origin == TOOL)     # a ToolCalled event tells of each
    state = RunState(run_dir=run_dir, journaled_calls=len(answers) - people - tools,
                     person_answers=people)
    segments = _segments(rows)
    seen_messages: dict[str, dict[str, Any]] = {}
    unreported = _unreported_answers(rows, answers)
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        _apply_segment(state, segment, seen_messages, unreported, last=last)
    for rest in unreported.values():     # journaled before any event: no line to put them on
        for answer in rest:
            _count(state, answer.action, _paid(answer), None)
    if not state.ended:
        state.history = sorted(seen_messages.values(), key=lambda m: int(m.get("round", 0)))
    return state


def _unreported_answers(rows: list[EventRow], answers: Sequence[AnswerRow]) -> dict[int, list[AnswerRow]]:
    """Paid answers without their `ModelAnswered` event (lost to a crash), by the seq of the
    last event before them. Older journals count paid answers in `LLMCalled`: none there."""
    if any(row.type == "LLMCalled" for row in rows):
        return {}
    reported = {row.data.get("request_hash") for row in rows
                if row.type == "ModelAnswered" and not row.data.get("reused")}
    unreported: dict[int, list[AnswerRow]] = {}
    for answer in answers:
        if answer.origin == "model" and answer.request_hash not in reported:
            unreported.setdefault(answer.seq, []).append(answer)
    return unreported


def _paid(answer: AnswerRow) -> Usage:
    stored = answer.answer
    return Usage.of_answer(stored.prompt_tokens, stored.completion_tokens, stored.cost_usd)


def _segments(rows: list[EventRow]) -> list[list[EventRow]]:
    """Split the event list at every RunStarted: one segment per invocation."""
    segments: list[list[EventRow]] = []
    for row in rows:
        if row.type == "RunStarted" or not segments:
            segments.append([])
        segments[-1].append(row)
    return segments


@dataclass
class _Invocation:
    """What one invocation's events leave open while they are read in order."""

    running: dict[tuple[int, str, str], ActionRecord] = field(default_factory=dict)
    choices: list[ModelEvent] = field(default_factory=list)    # state choices: outside any action
    messages: list[dict[str, Any]] = field(default_factory=list)

    def running_action(self, action: str) -> ActionRecord | None:
        """The line an answer of `action` journaled now belongs to (the latest one started)."""
        return next((r for (_, _, a), r in reversed(self.running.items()) if a == action), None)


def _apply_segment(state: RunState, segment: list[EventRow], seen: dict[str, dict[str, Any]],
                   unreported: dict[int, list[AnswerRow]], *, last: bool) -> None:
    invocation = _Invocation()
    state.ended_at = None
    state.questions = {}
    for row in segment:
        _apply_row(state, row, invocation, seen)
        for answer in unreported.pop(row.seq, []):   # journaled right after this event
            line = invocation.running_action(answer.action)
            _count(state, answer.action, _paid(answer), line)
            if line is not None:
                line.requests.append(answer.request_hash)
    for event in invocation.choices:
        _on_model_event(state, event, _line_of_choice(state, event))
    _close_invocation(state, segment, invocation)
    if last and state.ended:
        state.history = invocation.messages
    elif last:
        state.status, state.error = RunStatus.INTERRUPTED, ""


def _apply_row(state: RunState, row: EventRow, invocation: _Invocation,
               seen: dict[str, dict[str, Any]]) -> None:
    state.last_event_at = max(state.last_event_at, row.ts)
    if row.type == "RunLog":
        _on_log(state, row.data)
        return
    event = decode_event(row)
    running = invocation.running
    if isinstance(event, RunStarted):
        _on_started(state, event, row.ts)
        state.invocation_starts.append(row.ts)
    elif isinstance(event, RoundStarted):
        roles = state.round_roles.setdefault(event.round, [])
        roles.extend(r for r in event.active_roles if r not in roles)
        state.round_started.setdefault(event.round, row.ts)
        state.rounds = max(state.rounds, event.round)
    elif isinstance(event, ActionStarted):
        running[(event.round, event.role, event.action)] = _on_action_started(state, event, row.ts)
    elif isinstance(event, ModelEvent):
        record = running.get((event.round, event.role, event.action))
        if record is None:
            invocation.choices.append(event)
        elif not _rejected_before(state, event, record):
            _on_model_event(state, event, record)
            _note_call(record, event, row.ts)
    elif isinstance(event, ToolCalled):
        _on_tool_called(running.get((event.round, event.role, event.action)), event, row.ts)
    elif isinstance(event, ActionCompleted):
        _on_completed(state, event, running.pop((event.round, event.role, event.action), None), row.ts)
    elif isinstance(event, MessagePublished):
        invocation.messages.append(event.message)
        seen.setdefault(str(event.message.get("id")), event.message)
    elif isinstance(event, (QuestionAsked, PersonAnswered, PersonTold)):
        _on_person_event(state, event)
    elif isinstance(event, RunEnded):
        state.status, state.rounds, state.error = event.status, event.rounds, event.error
        state.shared = dict(event.shared)
        state.ended_at = row.ts
        if state.invocation_list:
            current = state.invocation_list[-1]
            current.status, current.error, current.rounds = event.status, event.error, event.rounds
            current.ended_at = row.ts


def _on_started(state: RunState, event: RunStarted, ts: float) -> None:
    state.invocations += 1
    if state.invocations == 1:
        state.run_id, state.sop_file, state.sop_name = event.run_id, event.sop_file, event.sop_name
        state.inputs, state.workspace, state.started_at = dict(event.inputs), event.workspace, ts
    state.sop_hash, state.model = event.sop_hash, event.model
    state.invocation_list.append(Invocation(state.invocations, ts, event.model, last_at=ts))


def _close_invocation(state: RunState, segment: list[EventRow], invocation: _Invocation) -> None:
    """The invocation's end: its last event, and the tries it left unfinished stop there
    with how it ended (a resume's try of the same action is a line of its own)."""
    if not state.invocation_list:      # a journal whose first rows are not a RunStarted
        return
    current = state.invocation_list[-1]
    current.last_at = max([current.last_at, *(row.ts for row in segment)])
    if current.ended_at is None:   # killed: the last round it started
        current.rounds = max([0, *(int(row.data.get("round", 0)) for row in segment if row.type == "RoundStarted")])
    why = current.error or (str(current.status) if current.ended_at is not None else
                            "the process stopped (killed) with this action running")
    for record in invocation.running.values():
        if not record.completed:
            record.stopped_at, record.error = current.ended_at or current.last_at, why


def _on_log(state: RunState, data: dict[str, Any]) -> None:
    """Keep warnings and notices for the timeline (info lines such as reuse notes repeat on
    every resume)."""
    if data.get("level") in ("warning", "notice") and data not in state.logs:
        state.logs.append(data)


def _on_action_started(state: RunState, event: ActionStarted, ts: float) -> ActionRecord:
    stats = state.actions.setdefault(event.action, ActionStats(event.action))
    stats.runs += 1
    if event.role not in stats.roles:
        stats.roles.append(event.role)
    record = next((r for r in reversed(state.timeline) if r.key == event.key), None)
    if record is None or not (record.completed or record.invocation == state.invocations):
        # a new action, or one an earlier invocation left unfinished: this try is a new line
        record = ActionRecord(event.round, event.role, event.action, event.key,
                              invocation=state.invocations)
        state.timeline.append(record)
    if not record.completed:
        record.started_at = ts
    return record


def _line_of_choice(state: RunState, event: ModelEvent) -> ActionRecord | None:
    """The timeline line a state choice is counted on: the action it names in its round,
    else the role's last action of the round (none: the role did nothing that round)."""
    same_round = [r for r in state.timeline if r.round == event.round and r.role == event.role]
    named = [r for r in same_round if r.action == event.action]
    lines = named or same_round
    return lines[-1] if lines else None


def _on_model_event(state: RunState, event: ModelEvent, record: ActionRecord | None) -> None:
    if isinstance(event, ModelAnswered):
        if not event.reused:
            state.unpriced_calls += event.unpriced
        if event.model:
            state.models[event.model] = state.models.get(event.model, 0) + 1
            if record is not None and event.model not in record.models:
                record.models.append(event.model)
        if record is not None:
            record.requests.append(event.request_hash)
    _count(state, event.action, event.usage, record)


def _rejected_before(state: RunState, event: ModelEvent, record: ActionRecord) -> bool:
    """Whether `event` rejects again an answer an earlier invocation already rejected: a
    resume reuses the journaled invalid answers of an unfinished action and rejects each
    again. Counted once; its re-ask counts when some invocation asked again after it."""
    if not isinstance(event, AnswerRejected):
        return False
    where = (record.key, event.attempt)
    if where not in state.rejections:
        state.rejections[where] = event.reask
        return False
    if event.reask and not state.rejections[where]:   # the resume asks on where the run gave up
        state.rejections[where] = True
        _count(state, event.action, Usage(reasks=1), record)
    return True


def _on_tool_called(record: ActionRecord | None, event: ToolCalled, ts: float) -> None:
    if record is not None:
        record.tools.append(ToolCallRecord(event.step, event.tool, dict(event.args), event.output,
                                           event.error, event.reused, event.seconds, ts))


def _count(state: RunState, action: str, usage: Usage, record: ActionRecord | None) -> None:
    """The one place usage is counted: on its timeline line (if any), that line's action row
    (else the named action's) and the total, alike."""
    if record is not None:
        record.usage += usage
        action = record.action
    stats = state.actions.setdefault(action, ActionStats(action))
    stats.usage += usage
    state.usage += usage


def _note_call(record: ActionRecord, event: ModelEvent, ts: float) -> None:
    """A paid answer's time in flight (it ends when its event is written), or a problem."""
    if isinstance(event, ModelAnswered) and not event.reused:
        record.calls.append((ts - max(event.seconds, 0.0), ts))
    elif isinstance(event, ModelRetried):
        record.problems.append(f"retry {event.retry}: {event.cause}")
    elif isinstance(event, AnswerRejected):
        again = "asked again" if event.reask else "no retries left"
        record.problems.append(f"answer rejected ({again}): {event.error}")


def _on_person_event(state: RunState, event: QuestionAsked | PersonAnswered | PersonTold) -> None:
    if isinstance(event, QuestionAsked):
        state.questions[str(event.question.get("key", ""))] = event.question
    elif isinstance(event, PersonAnswered):
        state.answered.setdefault(event.key, event.to_json())
    elif event.to_json() not in state.replies:     # a resume may tell it again
        state.replies.append(event.to_json())


def _on_completed(state: RunState, event: ActionCompleted, record: ActionRecord | None,
                  ts: float) -> None:
    state.completions[event.key] = state.completions.get(event.key, 0) + 1
    stats = state.actions.setdefault(event.action, ActionStats(event.action))
    if state.completions[event.key] == 1:
        stats.completed += 1
    if record is not None and not record.completed:
        record.completed, record.ended_at = True, ts
    for artifact in event.artifacts:
        state.artifacts[str(artifact.get("path"))] = str(artifact.get("sha256", ""))


def _add_meta(state: RunState, meta: dict[str, str]) -> None:
    """Where the run's SOP file is (absolute) and the folders its includes may come from."""
    state.sop_path = meta.get("sop_path", "")
    try:
        dirs = json.loads(meta.get("include_dirs", "[]"))
    except (ValueError, RecursionError):   # a tampered meta row: no include folders
        dirs = []
    state.include_dirs = [str(d) for d in dirs] if isinstance(dirs, list) else []


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


# --- the exchange: prompts and answers ---------------------------------------------------


@dataclass(frozen=True)
class Exchange:
    """One request and its answer: a model's (each ask and re-ask), or a question to a person.

    `messages` are as sent, secrets redacted (`[{"role": "system"|"user"|"assistant",
    "content": ...}]`; a person's question is one `user` message); empty when the journal
    did not keep them (written before sopctl kept prompts). `origin`: `model` (paid),
    `replay` (copied from the replayed run's journal) or `person`."""

    round: int
    role: str
    action: str
    attempt: int
    origin: str
    model: str
    messages: list[dict[str, Any]]
    answer: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    request_hash: str = ""
    response_format: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "role": self.role, "action": self.action,
                "attempt": self.attempt, "origin": self.origin, "model": self.model,
                "messages": self.messages, "answer": self.answer,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cost_usd": round(self.cost_usd, 6), "seconds": self.seconds,
                "request_hash": self.request_hash, "response_format": self.response_format}


def read_exchanges(run_dir: str | Path, action: str | None = None) -> list[Exchange]:
    """Every exchange of a run, in journal order; `action` keeps one action's (its id, or
    `Role.action`), and a name the run never asked for is a UsageError listing those it did."""
    with JournalReader.open(run_dir) as journal, naming(journal.path):
        found = exchanges_of(journal)
    if action is None:
        return found
    chosen = [e for e in found if action in (e.action, f"{e.role}.{e.action}")]
    if not chosen:
        names = sorted({e.action for e in found})
        raise UsageError(f"run {run_dir} has no exchange for action {action!r}",
                         f"its actions with prompts: {', '.join(names) or 'none'}")
    return chosen


def exchanges_of(journal: JournalReader) -> list[Exchange]:
    """The exchanges of an open journal (see `read_exchanges`)."""
    sent = journal.exchanges()
    asked = _where_asked(journal.events())
    out: list[Exchange] = []
    for row in journal.answers():
        where = asked.get(row.request_hash, {})
        answer, data = row.answer, sent.get(row.request_hash, {})
        messages = data.get("messages") or where.get("messages") or []
        out.append(Exchange(
            round=int(where.get("round", 0)), role=str(where.get("role", "")), action=row.action,
            attempt=int(data.get("attempt", where.get("attempt", 0))), origin=row.origin,
            model=answer.model, messages=list(messages), answer=answer.text,
            prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
            cost_usd=answer.cost_usd, seconds=answer.seconds, request_hash=row.request_hash,
            response_format=data.get("response_format")))
    return out


def _where_asked(rows: list[EventRow]) -> dict[str, dict[str, Any]]:
    """Round, role and attempt of each request hash (from the first ModelAnswered naming
    it), a person's question as its message (from QuestionAsked, keyed by question key), and
    a tool's command as its message (from ToolCalled, keyed by the result's call key)."""
    where: dict[str, dict[str, Any]] = {}
    for row in rows:
        data = row.data
        if row.type == "ModelAnswered":
            where.setdefault(str(data.get("request_hash")), data)
        elif row.type == "ToolCalled" and data.get("call"):   # a tool's result: its command is its request
            command = json.dumps({"command_name": data.get("tool"), "args": data.get("args")}, ensure_ascii=False)
            where.setdefault(str(data["call"]), {**data, "attempt": 0, "tool": data.get("tool"),
                                                 "messages": [{"role": "command", "content": command}]})
        elif row.type == "QuestionAsked" and isinstance(data.get("question"), dict):
            question = data["question"]
            where.setdefault(str(question.get("key")), {
                **data, "attempt": question.get("attempt", 0),
                "messages": [{"role": "user", "content": _question_text(question)}]})
    return where


def _question_text(question: dict[str, Any]) -> str:
    """What the person was shown: the question, and for a review the draft under review."""
    text = str(question.get("prompt", ""))
    draft = question.get("draft")
    if draft is None:
        return text
    shown = draft if isinstance(draft, str) else json.dumps(draft, ensure_ascii=False, indent=2)
    return f"{text}\n\n## Draft under review\n{shown}"
