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
- model usage: the `answers` table (each answer was paid for exactly once), and the reuse
  counts of the LLMCalled events.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .actions import default_model
from .api import check_limits
from .errors import JournalError, SopError, UsageError
from .events import (
    ActionCompleted,
    ActionStarted,
    LLMCalled,
    MessagePublished,
    RoundStarted,
    RunEnded,
    RunStarted,
)
from .journal import (
    JOURNAL_DIR,
    JOURNAL_FILE,
    EventRow,
    Journal,
    ReplayStore,
    decode_event,
    writer_active,
)

if TYPE_CHECKING:
    from .compiler import CompiledSop
    from .team import RunResult

__all__ = [
    "ActionStats", "ActionRecord", "RunState", "Origin",
    "read_run", "rebuild", "find_runs", "list_runs", "runs_json", "result_object",
    "render_show", "render_runs", "read_origin", "resume_run", "replay_run",
    "remove_orphan_temp_files", "progress_display",
]


@dataclass
class ActionStats:
    """Model usage of one action id over the whole run (paid answers) plus reuse counts."""

    action: str
    roles: list[str] = field(default_factory=list)
    runs: int = 0                  # times started, over all invocations
    completed: int = 0             # distinct idempotency keys completed
    calls: int = 0                 # answers paid for
    reused: int = 0                # answers taken from the journal
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


@dataclass
class ActionRecord:
    """One action execution in the timeline, identified by its idempotency key."""

    round: int
    role: str
    action: str
    key: str
    completed: bool = False
    calls: int = 0
    reused: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


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
    status: str = "interrupted"
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
    llm_calls: int = 0
    reused_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    journaled_calls: int = 0

    @property
    def ended(self) -> bool:
        return self.ended_at is not None


def read_run(run_dir: str | Path) -> RunState:
    """Open a run folder's journal read-only and rebuild its state (JournalError if unusable)."""
    with Journal.open(run_dir) as journal:
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
        elif isinstance(event, LLMCalled):
            _on_llm_called(state, event, open_actions.get((event.round, event.role, event.action)))
        elif isinstance(event, ActionCompleted):
            _on_completed(state, event, open_actions.pop((event.round, event.role, event.action), None))
        elif isinstance(event, MessagePublished):
            messages.append(event.message)
            seen.setdefault(str(event.message.get("id")), event.message)
        elif isinstance(event, RunEnded):
            state.status, state.rounds, state.error = event.status, event.rounds, event.error
            state.ended_at = row.ts
    if last and state.ended:
        state.history = messages
    elif last:
        state.status, state.error = "interrupted", ""


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


def _on_llm_called(state: RunState, event: LLMCalled, record: ActionRecord | None) -> None:
    stats = state.actions.setdefault(event.action, ActionStats(event.action))
    stats.reused += event.reused
    state.reused_calls += event.reused
    if record is not None:
        record.calls += event.calls
        record.reused += event.reused
        record.prompt_tokens += event.prompt_tokens
        record.completion_tokens += event.completion_tokens
        record.cost_usd += event.cost_usd


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
        state.journaled_calls += 1
        if row.origin != "model":
            continue
        stats = state.actions.setdefault(row.action, ActionStats(row.action))
        for target in (stats, state):
            target.prompt_tokens += row.answer.prompt_tokens
            target.completion_tokens += row.answer.completion_tokens
            target.cost_usd += row.answer.cost_usd
        stats.calls += 1
        state.llm_calls += 1


def _mark_live(state: RunState, run_dir: str | Path) -> None:
    """An unended run whose writer still holds the journal lock is `running`, not `interrupted`."""
    if not state.ended and writer_active(run_dir):
        state.status = "running"


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


def runs_json(rows: list[tuple[Path, RunState | JournalError]]) -> list[dict[str, Any]]:
    """`sopctl runs --format json`: one object per run folder."""
    out: list[dict[str, Any]] = []
    for path, item in rows:
        if isinstance(item, JournalError):
            out.append({"dir": str(path), "status": "unreadable", "error": str(item)})
            continue
        out.append({"id": item.run_id, "sop": item.sop_name, "status": item.status,
                    "rounds": item.rounds, "calls": item.llm_calls, "reused": item.reused_calls,
                    "cost_usd": round(item.cost_usd, 6), "started_at": _when(item.started_at),
                    "invocations": item.invocations, "dir": str(path)})
    return out


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


# --- rendering --------------------------------------------------------------------------


def result_object(state: RunState) -> dict[str, Any]:
    """The contract's result object for the run as the journal has it, plus `journaled_calls`."""
    return {
        "status": state.status,
        "rounds": state.rounds,
        "llm_calls": state.llm_calls,
        "reused_calls": state.reused_calls,
        "prompt_tokens": state.prompt_tokens,
        "completion_tokens": state.completion_tokens,
        "cost_usd": round(state.cost_usd, 6),
        "workspace": str(Path(state.run_dir).resolve()) if state.run_dir else state.workspace,
        "artifacts": sorted(state.artifacts),
        "history": [_summary(m) for m in state.history],
        "journaled_calls": state.journaled_calls,
        "run_id": state.run_id,
        "sop": state.sop_name,
        "sop_file": state.sop_file,
        "model": state.model,
        "invocations": state.invocations,
        "error": state.error,
        "actions": [_action_json(s) for s in state.actions.values()],
    }


def _summary(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": message.get("id"),
        "round": message.get("round", 0),
        "cause_by": message.get("cause_by"),
        "sent_from": message.get("sent_from"),
        "send_to": sorted(message.get("send_to") or []),
        "chars": len(str(message.get("content") or "")),
    }


def _action_json(stats: ActionStats) -> dict[str, Any]:
    return {"action": stats.action, "roles": stats.roles, "runs": stats.runs,
            "completed": stats.completed, "calls": stats.calls, "reused": stats.reused,
            "prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens,
            "cost_usd": round(stats.cost_usd, 6)}


def _when(ts: float) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _status_line(state: RunState) -> str:
    if state.status == "interrupted" and not state.ended:
        return "interrupted (no end recorded: the process was killed; `sopctl resume` continues it)"
    if state.status == "running":
        return "running (its process is still alive)"
    return state.status + (f" — {state.error}" if state.error else "")


def render_show(state: RunState) -> str:
    """The human timeline: header, rounds with roles, actions and messages, per-action usage."""
    lines = [
        f"run {state.run_id}  sop {state.sop_name} ({state.sop_file})  model {state.model}",
        f"started {_when(state.started_at)}  invocations {state.invocations}  "
        f"status {_status_line(state)}",
        "",
    ]
    rounds = set(state.round_roles) | {r.round for r in state.timeline}
    for rnd in sorted(rounds | {int(m.get("round", 0)) for m in state.history}):
        lines.append(f"round {rnd}  roles: {', '.join(state.round_roles.get(rnd, [])) or '-'}")
        lines += [_action_line(r) for r in state.timeline if r.round == rnd]
        lines += [_message_line(m) for m in state.history if int(m.get("round", 0)) == rnd]
        lines += [f"    warning: {g.get('role')}.{g.get('action')}: {g.get('message')}"
                  for g in state.logs if g.get("round") == rnd]
    lines += ["", "per action:", _stats_header()]
    lines += [_stats_line(s) for s in state.actions.values()]
    lines.append(f"total: {state.llm_calls} model calls, {state.reused_calls} reused, "
                 f"{state.journaled_calls} journaled, {state.prompt_tokens}+"
                 f"{state.completion_tokens} tokens, ${state.cost_usd:.4f}")
    if state.artifacts:
        lines.append("artifacts: " + ", ".join(sorted(state.artifacts)))
    return "\n".join(lines)


def _action_line(record: ActionRecord) -> str:
    mark = "done" if record.completed else "NOT COMPLETED"
    return (f"  {record.role}.{record.action}  [{mark}]  calls {record.calls}  reused "
            f"{record.reused}  tokens {record.prompt_tokens}+{record.completion_tokens}  "
            f"${record.cost_usd:.4f}")


def _message_line(message: dict[str, Any]) -> str:
    to = ",".join(sorted(message.get("send_to") or []))
    chars = len(str(message.get("content") or ""))
    return (f"    -> {message.get('id')}  {message.get('cause_by')}  "
            f"{message.get('sent_from')} -> {to}  {chars} chars")


def _stats_header() -> str:
    return f"  {'action':<24} {'roles':<20} {'runs':>4} {'calls':>5} {'reused':>6} {'tokens':>13} {'cost':>9}"


def _stats_line(s: ActionStats) -> str:
    tokens = f"{s.prompt_tokens}+{s.completion_tokens}"
    return (f"  {s.action:<24} {','.join(s.roles):<20} {s.runs:>4} {s.calls:>5} {s.reused:>6} "
            f"{tokens:>13} ${s.cost_usd:>8.4f}")


def render_runs(rows: list[tuple[Path, RunState | JournalError]]) -> str:
    """The `sopctl runs` table; an unreadable journal is a row saying why, not a failure."""
    header = f"{'id':<24} {'sop':<20} {'status':<12} {'rounds':>6} {'calls':>5} {'cost':>9}  {'when':<20} dir"
    lines = [header]
    for path, item in rows:
        if isinstance(item, JournalError):
            lines.append(f"{'?':<24} {'?':<20} {'unreadable':<12} {'':>6} {'':>5} {'':>9}  "
                         f"{'':<20} {path}  ({item.message})")
            continue
        lines.append(f"{item.run_id[:24]:<24} {item.sop_name[:20]:<20} {item.status:<12} "
                     f"{item.rounds:>6} {item.llm_calls:>5} ${item.cost_usd:>8.4f}  "
                     f"{_when(item.started_at):<20} {path}")
    return "\n".join(lines)


# --- resume and replay --------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    """How a run was started, as its journal has it (resume and replay start from here)."""

    first: RunStarted              # the run's own start: id, inputs
    last: RunStarted               # the latest invocation: SOP hash, model, rounds, budget
    sop_path: Path
    ended_status: str              # "" when the last invocation has no RunEnded


def read_origin(run_dir: str | Path) -> Origin:
    """The first and latest RunStarted of a run and where its SOP file is now."""
    with Journal.open(run_dir) as journal:
        rows = journal.events()
        meta = journal.meta()
    starts = [decode_event(r) for r in rows if r.type == "RunStarted"]
    if not starts:
        raise JournalError(f"the journal of {run_dir} has no RunStarted event",
                           "the run died before it started; run it again with `sopctl run`")
    state = rebuild(rows, run_dir=str(run_dir))
    first, last = starts[0], starts[-1]
    assert isinstance(first, RunStarted) and isinstance(last, RunStarted)
    return Origin(first, last, _sop_path(meta, last), state.status if state.ended else "")


def _sop_path(meta: dict[str, str], last: RunStarted) -> Path:
    """The SOP file: the absolute path the journal remembers, else the recorded one."""
    for candidate in (meta.get("sop_path", ""), last.sop_file):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise JournalError(f"the run's SOP file {meta.get('sop_path') or last.sop_file} is gone",
                       "put the file back where it was (or run from the folder the run started in)")


def _compile(path: Path) -> CompiledSop:
    """The run's SOP compiled again; an unreadable or now-invalid file is a usage error (2)."""
    from .compiler import compile_path
    from .errors import LoadError

    try:
        return compile_path(path)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except LoadError as exc:
        first = next((d for d in exc.diagnostics if d.is_error), None)
        where = f"{first.file or path}:{first.line}:{first.col}: {first.message}" if first else exc.message
        raise UsageError(f"the run's SOP file is no longer valid: {where}",
                         f"see every problem with `sopctl validate {path}`") from None


def _check_unchanged(origin: Origin, force: bool) -> None:
    """Refuse to resume with an SOP file other than the one the run (last) started with."""
    try:
        digest = hashlib.sha256(origin.sop_path.read_bytes()).hexdigest()
    except OSError as exc:
        raise UsageError(f"cannot read {origin.sop_path}: {exc.strerror or exc}") from None
    if digest != origin.last.sop_hash and not force:
        raise JournalError(f"the SOP file {origin.sop_path} changed since the run started "
                           f"(sha256 {origin.last.sop_hash[:12]} -> {digest[:12]})",
                           "resuming with a different SOP may mix two pipelines; pass --force "
                           "to do it anyway, or `sopctl run` it afresh")


def _model_override(compiled: CompiledSop, recorded: str, explicit: str | None) -> str | None:
    """`--model` if given; else the recorded model only if today's default would differ.

    Passing the recorded model as an override when it *is* the default would also override
    per-role and per-action models, which the original run did not do.
    """
    if explicit:
        return explicit
    return None if recorded == default_model(compiled) else recorded


def resume_run(run_dir: str | Path, *, budget: float | None = None, rounds: int | None = None,
               model: str | None = None, allow_exec: bool = False, force: bool = False,
               observers: tuple[Any, ...] = ()) -> RunResult:
    """Continue a run in its own workspace: same run id, completed actions and answers reused.

    Refuses (JournalError) when the SOP file changed since the run (last) started, unless
    `force`. Returns the interpreter's RunResult of this invocation.
    """
    check_limits(rounds, budget)
    origin = read_origin(run_dir)
    _check_unchanged(origin, force)
    compiled = _compile(origin.sop_path)
    options: dict[str, Any] = {
        "model": _model_override(compiled, origin.last.model, model),
        "max_rounds": rounds or origin.last.max_rounds,
        "budget_usd": origin.last.budget_usd if budget is None else budget,
        "workspace": str(Path(run_dir).resolve()), "allow_exec": allow_exec,
        "run_id": origin.first.run_id,
    }
    def journal_for(ws: Path) -> Journal:
        journal = Journal.for_run(ws, compiled, force=force)
        remove_orphan_temp_files(ws)      # safe now: we hold the writer lock
        return journal

    result = _run(compiled, origin.first.inputs, options, journal_for, observers)
    _add_earlier_artifacts(result, run_dir)
    return result


def remove_orphan_temp_files(workspace: Path) -> list[str]:
    """Delete the temp files of artifact writes a killed process left (`.sopctl-*.tmp`).

    The workspace writes every artifact to a temp file and renames it; a kill -9 between
    the two leaves the temp file behind. Only call this while holding the journal's writer
    lock, so that no live process is in the middle of such a write. Symlinks are left alone.
    """
    removed: list[str] = []
    for folder, dirs, names in os.walk(workspace, followlinks=False):
        dirs[:] = [d for d in dirs if d != JOURNAL_DIR]
        for name in names:
            path = Path(folder) / name
            if name.startswith(".sopctl-") and name.endswith(".tmp") and not path.is_symlink():
                path.unlink(missing_ok=True)
                removed.append(path.relative_to(workspace).as_posix())
    return removed


def _add_earlier_artifacts(result: RunResult, run_dir: str | Path) -> None:
    """Actions reused from the journal wrote their files earlier: list those too."""
    root = Path(run_dir)
    earlier = {p for p in read_run(root).artifacts if (root / p).is_file()}
    result.artifacts = sorted(set(result.artifacts) | earlier)


def replay_run(run_dir: str | Path, out: str | Path, *, allow_exec: bool = False,
               observers: tuple[Any, ...] = ()) -> tuple[RunResult, bool]:
    """Run the SOP again in `out` with every answer from `run_dir`'s journal; no model called.

    Returns (RunResult, diverged): diverged is True when the run asked for a request the
    journal lacks (the run then ends `failed` with the divergence as its error).
    """
    origin = read_origin(run_dir)
    target = Path(out)
    if target.resolve() == Path(run_dir).resolve():
        raise UsageError("--out must be another folder than the run being replayed")
    if (target / JOURNAL_DIR / JOURNAL_FILE).exists():
        raise UsageError(f"{out} already holds a run", "replay into a new or empty folder")
    compiled = _compile(origin.sop_path)
    options: dict[str, Any] = {
        "model": _model_override(compiled, origin.last.model, None),
        "max_rounds": origin.last.max_rounds, "budget_usd": origin.last.budget_usd,
        "workspace": str(target), "allow_exec": allow_exec, "run_id": origin.first.run_id,
        "replay": True,
    }
    with Journal.open(run_dir) as source:
        stores: list[ReplayStore] = []

        def journal_for(ws: Path) -> Journal:
            journal = Journal.for_run(ws, compiled)
            stores.append(ReplayStore(source, journal))
            return journal

        result = _run(compiled, origin.first.inputs, options, journal_for, observers, stores)
    return result, bool(stores and stores[0].misses)


def _run(compiled: CompiledSop, inputs: dict[str, Any], options: dict[str, Any],
         journal_for: Callable[[Path], Journal], observers: tuple[Any, ...],
         stores: list[ReplayStore] | None = None) -> RunResult:
    """Prepare the team, open its journal, attach it (and a replay store), run to the end."""
    import asyncio

    from .api import prepare

    team = prepare(compiled, inputs, **options)
    team.check()
    journal = journal_for(team.workspace.root)
    try:
        if stores:
            team.ctx.gateway.store = stores[0]
        team.options.observers = [*observers]
        team.attach(journal)
        return asyncio.run(team.run())
    finally:
        journal.close()


def progress_display(origin: Origin) -> Any:
    """The progress display of `sopctl run` (stderr), for a resume or a replay."""
    from .display import make_display

    try:
        roles = list(_compile(origin.sop_path).spec.roles)
    except SopError:
        roles = []
    return make_display(roles)

