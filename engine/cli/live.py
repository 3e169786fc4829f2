"""What a person watching `sopctl run` sees: a live table on a terminal, plain lines otherwise.

Both are `RunObserver`s fed by the same event stream as the journal, so the display can
never disagree with what was recorded: a retry after a transient model error and a re-ask
after an invalid answer appear as they happen, and are counted in the headline. Progress
goes to stderr; stdout is kept for the result (the summary, or the one JSON object of
`--format json`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import IO, Any

from engine.models.types import Usage
from engine.run.events import (
    ActionCompleted,
    ActionStarted,
    AnswerRejected,
    ModelEvent,
    ModelRetried,
    PersonAnswered,
    PersonTold,
    QuestionAsked,
    RoundStarted,
    RunEnded,
    RunEvent,
    RunLog,
    RunStarted,
)

__all__ = ["RunStats", "PlainProgress", "LiveDisplay", "make_display", "trouble_line", "person_line", "usage_notes",
           "printable"]


def usage_notes(usage: Usage, *, reused: bool = True) -> list[str]:
    """What else the answers came to, in words, only what happened: `+2 reused` (unless
    `reused` is False), `1 retries`, `1 re-asks`. The headline, `show` and the summary say it alike."""
    counts = ((f"+{usage.reused_calls} reused", usage.reused_calls if reused else 0),
              (f"{usage.retries} retries", usage.retries), (f"{usage.reasks} re-asks", usage.reasks))
    return [note for note, n in counts if n]


@dataclass
class RunStats:
    """Totals and each role's state, folded from events (shared by both displays)."""

    run_id: str = ""
    model: str = ""
    round: int = 0
    max_rounds: int = 0
    usage: Usage = Usage()
    roles: dict[str, str] = field(default_factory=dict)
    role_calls: dict[str, int] = field(default_factory=dict)   # answers read, paid or reused

    def fold(self, event: RunEvent) -> None:
        if isinstance(event, RunStarted):
            self.run_id, self.model, self.max_rounds = event.run_id, event.model, event.max_rounds
        elif isinstance(event, RoundStarted):
            self.round = event.round
            for role in self.roles:
                self.roles[role] = "working" if role in event.active_roles else "idle"
        elif isinstance(event, ActionStarted):
            self.roles[event.role] = f"running {event.action}"
        elif isinstance(event, ActionCompleted):
            self.roles[event.role] = f"done {event.action}"
        elif isinstance(event, QuestionAsked):
            self.roles[event.role] = f"asking a person ({event.action})"
        elif isinstance(event, PersonAnswered):
            self.roles[event.role] = f"running {event.action}"
        elif isinstance(event, ModelEvent):
            self._add_usage(event)

    def _add_usage(self, event: ModelEvent) -> None:
        usage = event.usage
        self.usage += usage
        answers = usage.llm_calls + usage.reused_calls
        self.role_calls[event.role] = self.role_calls.get(event.role, 0) + answers

    def headline(self) -> str:
        u = self.usage
        notes = usage_notes(u)
        reused = f" ({notes.pop(0)})" if u.reused_calls else ""
        trouble = "".join(f" · {note}" for note in notes)
        return (f"round {self.round}/{self.max_rounds} · {u.llm_calls} calls{reused}{trouble} · "
                f"{u.prompt_tokens}+{u.completion_tokens} tokens · ${u.cost_usd:.4f}")


def person_line(event: RunEvent) -> str:
    """A person's part as it happens: a question, its answer, a message to the person."""
    if isinstance(event, QuestionAsked):
        return (f"  {event.role}: {event.action}: a question for a person "
                f"({event.question.get('kind')}, question {str(event.question.get('key'))[:12]})")
    if isinstance(event, PersonAnswered):
        how = "taken from the journal" if event.reused else f"given{' by ' + event.by if event.by else ''}"
        return f"  {event.role}: {event.action}: a person's answer ({event.decision}) {how}"
    if isinstance(event, PersonTold):
        return f"  {event.role} -> you: {event.text}"
    return ""


_CONTROL = {code: f"\\x{code:02x}" for code in (*range(0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0))}
"""Characters a terminal acts on (ESC starts a sequence that can move the cursor, retitle the
window or rewrite what was printed; C1 0x9b is a one-byte CSI), all but tab and newline,
each with the escape it is printed as."""


def printable(text: str) -> str:
    """`text` safe to print to a terminal: each control character shown as `\\xNN`. A model's
    answer or a person's text from the journal (`show`, `show --prompts`, `runs`) is printed
    as it reads, never acted on."""
    return text.translate(_CONTROL)


def trouble_line(event: RunEvent) -> str:
    """What a person should see of a retry or a re-ask, as it happens ('' for other events)."""
    if isinstance(event, ModelRetried):
        return (f"{event.role}: {event.action}: model error, retry {event.retry} in "
                f"{event.delay_s:.1f} s: {event.cause}")
    if isinstance(event, AnswerRejected):
        then = "asking again" if event.reask else "no retries left"
        return (f"{event.role}: {event.action}: invalid answer (attempt {event.attempt + 1}), "
                f"{then}: {event.error}")
    return ""


class PlainProgress:
    """One line per thing that happened, for logs and pipes (no terminal control codes)."""

    def __init__(self, stream: IO[str] | None = None, roles: list[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.stats = RunStats(roles={r: "idle" for r in roles or []})

    def on_event(self, event: RunEvent) -> None:
        self.stats.fold(event)
        line = self._line(event)
        if line:    # a model's or a person's words in it: printed, never acted on
            print(printable(line), file=self.stream, flush=True)

    def _line(self, event: RunEvent) -> str:
        if isinstance(event, RunStarted):
            return f"sopctl: run {event.run_id} of {event.sop_name} on {event.model} -> {event.workspace}"
        if isinstance(event, RoundStarted):
            return f"round {event.round}: {', '.join(event.active_roles)}"
        if isinstance(event, ActionStarted):
            return f"  {event.role}: {event.action} ..."
        if isinstance(event, ActionCompleted):
            files = f", {len(event.artifacts)} file(s)" if event.artifacts else ""
            return f"  {event.role}: {event.action} done{files} [{self.stats.headline()}]"
        if isinstance(event, RunLog):
            return f"  {event.level}: {event.role + ': ' if event.role else ''}{event.message}"
        if trouble := trouble_line(event):
            return f"  warning: {trouble}"
        if isinstance(event, RunEnded):
            return f"run ended: {event.status} after {event.rounds} round(s)"
        return person_line(event)


class LiveDisplay:
    """A rich Live table: the round, each role's state and calls, tokens and cost."""

    def __init__(self, roles: list[str], stream: IO[str] | None = None) -> None:
        from rich.console import Console   # here: rich only for a live table on a terminal

        self.console = Console(file=stream or sys.stderr)
        self.stats = RunStats(roles={r: "idle" for r in roles})
        self.logs: list[str] = []
        self.live: Any = None

    def on_event(self, event: RunEvent) -> None:
        self.stats.fold(event)
        if isinstance(event, RunLog) and event.level in ("warning", "notice"):
            self.logs = (self.logs + [printable(f"{event.role}: {event.message}")])[-3:]
        elif trouble := trouble_line(event):
            self.logs = (self.logs + [printable(trouble)])[-3:]
        if isinstance(event, QuestionAsked):
            self.close()               # the terminal is the person's while they answer
        elif isinstance(event, PersonTold):
            from rich.markup import escape   # here: as Console above

            self.console.print(f"[bold]{escape(event.role)} -> you:[/] {escape(printable(event.text))}",
                               highlight=False)
        if isinstance(event, (RunStarted, PersonAnswered)) and self.live is None:
            self._start()
        elif self.live is not None:
            self.live.update(self._render())
        if isinstance(event, RunEnded):
            self.close()

    def _start(self) -> None:
        from rich.live import Live   # here: as Console above

        self.live = Live(self._render(), console=self.console, refresh_per_second=8, transient=False)
        self.live.start()

    def close(self) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.stop()
            self.live = None

    def _render(self) -> Any:
        from rich.markup import escape   # here: as Console above
        from rich.table import Table   # here: as Console above

        table = Table(title=f"sopctl {self.stats.run_id} · {self.stats.model}",
                      caption=self.stats.headline(), expand=False, min_width=64)
        table.add_column("role")
        table.add_column("state")
        table.add_column("calls", justify="right")
        for role, state in self.stats.roles.items():
            style = "green" if state.startswith("running") else ("dim" if state == "idle" else "")
            table.add_row(role, f"[{style}]{state}[/]" if style else state,
                          str(self.stats.role_calls.get(role, 0)))
        for line in self.logs:
            table.add_row("", f"[yellow]{escape(line)}[/]", "")   # a model's '[link=...]' is text
        return table


def make_display(roles: list[str], stream: IO[str] | None = None) -> PlainProgress | LiveDisplay:
    """The live table on a terminal, plain lines otherwise (pipes, CI, files)."""
    stream = stream or sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        return LiveDisplay(roles, stream)
    return PlainProgress(stream, roles)
