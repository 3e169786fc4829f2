"""What the commands print: a run's result, `sopctl show`'s timeline and `sopctl runs`' table,
as text for people or JSON for tools."""

from __future__ import annotations

import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.check.diagnostics import format_diagnostic
from engine.cli.live import printable, usage_notes
from engine.cli.person import answer_hint, format_question
from engine.compile.compiler import source_lines
from engine.errors import JournalError
from engine.journal.history import ActionRecord, ActionStats, RunState
from engine.models.types import Usage
from engine.run.events import RunStatus
from engine.run.people import Question, waiting_summary

if TYPE_CHECKING:
    from engine.run.team import RunResult

__all__ = ["runs_json", "result_object", "format_show", "format_runs", "summary", "print_result",
           "status_line", "format_time", "printable",
           "EXIT_CODES"]


def runs_json(rows: list[tuple[Path, RunState | JournalError]]) -> list[dict[str, Any]]:
    """`sopctl runs --format json`: one object per run folder."""
    out: list[dict[str, Any]] = []
    for path, item in rows:
        if isinstance(item, JournalError):
            out.append({"dir": str(path), "status": "unreadable", "error": str(item)})
            continue
        usage = item.usage
        out.append({"id": item.run_id, "sop": item.sop_name, "status": item.status,
                    "rounds": item.rounds, "calls": usage.llm_calls, "reused": usage.reused_calls,
                    "cost_usd": round(usage.cost_usd, 6), "started_at": format_time(item.started_at),
                    "invocations": item.invocations, "dir": str(path),
                    "waiting_for": _waiting_id(item), **_run_totals(item)})
    return out


def _run_totals(state: RunState) -> dict[str, Any]:
    """What a run came to, for `runs --format json`: tokens, the trouble, the model, when it
    ended, and the question it waits for (None when it waits for none)."""
    usage, pending = state.usage, state.waiting_for
    return {"model": state.model, "ended_at": format_time(state.ended_at) if state.ended_at else None,
            "error": state.error, "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens, "cached_tokens": usage.cached_tokens,
            "tokens": usage.prompt_tokens + usage.completion_tokens,
            "retries": usage.retries, "reasks": usage.reasks,
            "journaled_calls": state.journaled_calls, "unpriced_calls": state.unpriced_calls,
            "person_answers": state.person_answers,
            "question": waiting_summary(pending) if pending else None}


# --- rendering --------------------------------------------------------------------------


def result_object(state: RunState) -> dict[str, Any]:
    """The contract's result object for the run as the journal has it, plus `journaled_calls`,
    the retries and re-asks, and usage per action."""
    usage = state.usage
    return {
        "status": state.status,
        "rounds": state.rounds,
        "llm_calls": usage.llm_calls,
        "reused_calls": usage.reused_calls,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "cost_usd": round(usage.cost_usd, 6),
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
        "retries": usage.retries,
        "reasks": usage.reasks,
        "unpriced_calls": state.unpriced_calls,
        **_person_json(state),
        **({"state": state.shared} if state.shared else {}),   # as `run --format json` has it
    }


def _person_json(state: RunState) -> dict[str, Any]:
    """A person's part: the question a waiting run waits for, answers given, replies told."""
    pending = state.waiting_for
    return {"waiting_for": waiting_summary(pending) if pending else None,
            "person_answers": state.person_answers, "replies": state.replies}


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
    usage = stats.usage
    return {"action": stats.action, "roles": stats.roles, "runs": stats.runs,
            "completed": stats.completed, "calls": usage.llm_calls, "reused": usage.reused_calls,
            "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens, "cost_usd": round(usage.cost_usd, 6), "retries": usage.retries, "reasks": usage.reasks}


def format_time(ts: float) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _waiting_id(state: RunState) -> str | None:
    """`Role.Action (question ID)` of a waiting run's question; None when it waits for none."""
    pending = state.waiting_for
    if pending is None:
        return None
    return f"{pending.get('role')}.{pending.get('action')} (question {str(pending.get('key', ''))[:12]})"


def status_line(state: RunState) -> str:
    if state.status == RunStatus.INTERRUPTED and not state.ended:
        return "interrupted (no end recorded: the process was killed; `sopctl resume` continues it)"
    if state.status == RunStatus.RUNNING:
        return "running (its process is still alive)"
    if state.status == RunStatus.WAITING:
        waits = _waiting_id(state)
        return (f"waiting for a person: {waits}" if waits else
                "waiting (answered: `sopctl resume` continues it)")
    return f"{state.status}" + (f" — {state.error}" if state.error else "")


def format_show(state: RunState) -> str:
    """The human timeline: header, rounds with roles, actions and messages, per-action usage."""
    lines = [
        f"run {state.run_id}  sop {state.sop_name} ({state.sop_file})  model {state.model}",
        f"started {format_time(state.started_at)}  invocations {state.invocations}  "
        f"status {status_line(state)}",
        "",
    ]
    rounds = set(state.round_roles) | {r.round for r in state.timeline}
    for rnd in sorted(rounds | {int(m.get("round", 0)) for m in state.history}):
        lines.append(f"round {rnd}  roles: {', '.join(state.round_roles.get(rnd, [])) or '-'}")
        lines += [_action_line(r, state.invocations) for r in state.timeline if r.round == rnd]
        lines += [_message_line(m) for m in state.history if int(m.get("round", 0)) == rnd]
        lines += [f"    person: {g.get('role')}.{g.get('action')}: {g.get('decision')} "
                  f"(question {str(g.get('key'))[:12]})"
                  for g in state.answered.values() if g.get("round") == rnd]
        lines += [f"    {g.get('level')}: {g.get('role')}.{g.get('action')}: {g.get('message')}"
                  for g in state.logs if g.get("round") == rnd]
    lines += ["", "per action:", _stats_header()]
    lines += [_stats_line(s) for s in state.actions.values()]
    usage = state.usage
    lines.append(f"total: {usage.llm_calls} model calls, {usage.reused_calls} reused, "
                 f"{usage.retries} retries, {usage.reasks} re-asks, "
                 f"{state.journaled_calls} journaled, {usage.prompt_tokens}+"
                 f"{usage.completion_tokens} tokens{cached_note(usage)}, ${usage.cost_usd:.4f}")
    if state.unpriced_calls:
        lines.append(f"cost unknown: {state.unpriced_calls} model call(s) priced $0 because "
                     "their model's price is unknown (give one with --price or the file's "
                     "llm.price)")
    if state.artifacts:
        lines.append("artifacts: " + ", ".join(sorted(state.artifacts)))
    lines += _state_lines(state)
    lines += _person_lines(state)
    return "\n".join(lines)


def _state_lines(state: RunState) -> list[str]:
    """The shared state as the run ended, one variable a line (its value as JSON, shortened)."""
    if not state.shared:
        return []
    lines = ["state:"]
    for name, value in state.shared.items():
        text = json.dumps(value, ensure_ascii=False)
        lines.append(f"  {name} = {text if len(text) <= 200 else text[:197] + '...'}")
    return lines


def _person_lines(state: RunState) -> list[str]:
    """Messages roles sent to the person, and the question a waiting run waits for."""
    lines = [f"to you from {r.get('role')} ({r.get('action')}, round {r.get('round')}): {r.get('text')}"
             for r in state.replies]
    if state.person_answers:
        lines.append(f"a person answered {state.person_answers} question(s)")
    pending = state.waiting_for
    if pending is not None and state.status == RunStatus.WAITING:

        lines += ["", waiting_text(Question.from_json(pending), state.run_dir)]
    elif pending is not None and state.status == RunStatus.INTERRUPTED:
        lines.append(f"stopped while asking a person: {_waiting_id(state)}; `sopctl resume` "
                     "asks it again")
    return lines


def _action_line(record: ActionRecord, invocations: int = 1) -> str:
    mark = "done" if record.completed else "NOT COMPLETED"
    if not record.completed and record.invocation < invocations:   # a resume ran it again
        mark += f" in invocation {record.invocation}, resumed"
    usage = record.usage
    trouble = "".join(f"  {note}" for note in usage_notes(usage, reused=False))
    return (f"  {record.role}.{record.action}  [{mark}]  calls {usage.llm_calls}  reused "
            f"{usage.reused_calls}  tokens {usage.prompt_tokens}+{usage.completion_tokens}"
            f"{cached_note(usage)}  ${usage.cost_usd:.4f}{trouble}")


def _message_line(message: dict[str, Any]) -> str:
    to = ",".join(sorted(message.get("send_to") or []))
    chars = len(str(message.get("content") or ""))
    return (f"    -> {message.get('id')}  {message.get('cause_by')}  "
            f"{message.get('sent_from')} -> {to}  {chars} chars")


def _stats_header() -> str:
    return (f"  {'action':<24} {'roles':<20} {'runs':>4} {'calls':>5} {'reused':>6} "
            f"{'retries':>7} {'re-asks':>7} {'tokens':>13} {'cost':>9}")


def _stats_line(s: ActionStats) -> str:
    u = s.usage
    tokens = f"{u.prompt_tokens}+{u.completion_tokens}"
    return (f"  {s.action:<24} {','.join(s.roles):<20} {s.runs:>4} {u.llm_calls:>5} "
            f"{u.reused_calls:>6} {u.retries:>7} {u.reasks:>7} {tokens:>13} ${u.cost_usd:>8.4f}")


def cached_note(usage: Usage) -> str:
    """` (N of the prompt tokens cached)`: read from the provider's prompt cache, billed lower;
    nothing when none were (fake, local, a provider without a cache)."""
    return f" ({usage.cached_tokens} of the prompt tokens cached)" if usage.cached_tokens else ""


def format_runs(rows: list[tuple[Path, RunState | JournalError]]) -> str:
    """The `sopctl runs` table; an unreadable journal is a row saying why, not a failure."""
    header = f"{'id':<24} {'sop':<20} {'status':<12} {'rounds':>6} {'calls':>5} {'cost':>9}  {'when':<20} dir"
    lines = [header]
    for path, item in rows:
        if isinstance(item, JournalError):
            lines.append(f"{'?':<24} {'?':<20} {'unreadable':<12} {'':>6} {'':>5} {'':>9}  "
                         f"{'':<20} {path}  ({item.message})")
            continue
        lines.append(f"{item.run_id[:24]:<24} {item.sop_name[:20]:<20} {item.status:<12} "
                     f"{item.rounds:>6} {item.usage.llm_calls:>5} ${item.usage.cost_usd:>8.4f}  "
                     f"{format_time(item.started_at):<20} {path}"
                     + (f"  (waits for {waits})" if (waits := _waiting_id(item)) else "")
                     + (f"  ({item.usage.cached_tokens} prompt tokens cached)" if item.usage.cached_tokens else ""))
    return "\n".join(lines + _runs_total(rows))


def _runs_total(rows: list[tuple[Path, RunState | JournalError]]) -> list[str]:
    """The folder's total under the table: what all its readable runs cost together."""
    states = [item for _, item in rows if not isinstance(item, JournalError)]
    if len(states) < 2:
        return []
    usage = sum((s.usage for s in states), Usage())
    return [f"total: {len(states)} runs, {usage.llm_calls} model calls, "
            f"{usage.prompt_tokens}+{usage.completion_tokens} tokens{cached_note(usage)}, ${usage.cost_usd:.4f}"]


def summary(result: RunResult) -> str:
    """The final summary of a RunResult, for people (`--format text`)."""
    lines = [
        # only the error's first line: print_result shows all of it (hint too) on stderr, once
        f"status:    {result.status}" + _why(result),
        f"rounds:    {result.rounds}",
        f"llm calls: {result.llm_calls}" + _call_notes(result.usage),
        f"tokens:    {result.prompt_tokens} prompt + {result.completion_tokens} completion"
        + cached_note(result.usage),
        f"cost:      ${result.cost_usd:.4f}",
        f"workspace: {result.workspace}",
        f"messages:  {len(result.messages)}",
    ]
    if result.artifacts:
        lines.append("artifacts:")
        lines += [f"  {path}" for path in result.artifacts]
    return "\n".join(lines + next_commands(result))


def _why(result: RunResult) -> str:
    """` (the error's first line)`, unless it only repeats the status ("interrupted")."""
    first = result.error.splitlines()[0] if result.error else ""
    return f" ({first})" if first and first != result.status else ""


def next_commands(result: RunResult) -> list[str]:
    """What to run next: look at the run, and pick it up again if it stopped short."""
    ws = shlex.quote(result.workspace)
    lines = [f"next:      sopctl show {ws}      # timeline, tokens and cost per action",
             f"           sopctl report {ws}    # the run as one HTML page"]
    if result.status == RunStatus.BUDGET:
        lines.append(f"           sopctl resume {ws} --budget USD   # with more budget")
    elif result.status in (RunStatus.INTERRUPTED, RunStatus.FAILED):
        lines.append(f"           sopctl resume {ws}    # go on from where it stopped; paid answers are reused")
    elif result.status == RunStatus.MAX_ROUNDS:
        lines.append(f"           sopctl resume {ws} --rounds N   # go on for more rounds")
    return lines



def _call_notes(usage: Usage) -> str:
    """` (+2 reused; 1 retries; 1 re-asks)`: only what happened, nothing when none did."""
    notes = usage_notes(usage)
    return f" ({'; '.join(notes)})" if notes else ""


def print_result(result: RunResult, fmt: str) -> int:
    """Print a run's result (`run`, `resume`, `replay`); the exit code of its status (contract §6)."""
    if fmt == "json":
        print(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        print(summary(result))
    if result.diagnostic is not None:  # a run-time failure, shown as the checker shows one
        print(format_diagnostic(result.diagnostic, source_lines(result.diagnostic.file)), file=sys.stderr)
    elif result.waiting_for is not None:
        print(waiting_text(result.waiting_for, result.workspace), file=sys.stderr)
    elif result.error:
        print(f"sopctl: {result.status}: {result.error}", file=sys.stderr)
    return EXIT_CODES.get(result.status, 1)


def waiting_text(question: Question, run_dir: str) -> str:
    """What a waiting run waits for, and how to answer it (after `run`, `resume`, in `show`)."""
    return (f"sopctl: waiting for a person (exit 75)\n{format_question(question)}\n\n"
            f"answer with: {answer_hint(question, run_dir)}\n"
            f"then:        sopctl resume {run_dir}   (or add --resume to `sopctl answer`)")


EXIT_CODES = {RunStatus.IDLE: 0, RunStatus.MAX_ROUNDS: 0, RunStatus.INTERRUPTED: 130,
              RunStatus.WAITING: 75}
"""Exit code per run status; anything else (failed, budget) is 1. 75 is EX_TEMPFAIL ("try
again later"): the run waits for a person's answer (`sopctl answer`, then `sopctl resume`)."""
