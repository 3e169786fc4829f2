"""What a tool-using role keeps from one activation to the next (MetaGPT's RoleZero keeps its
Planner and its memory): its plan, one per role, that every `plan` command of its tool loops
works on; its working memory, the messages that woke it, those it heard (`team.public_chat`)
and its earlier tool steps (the commands and their outputs), of which a loop's prompt shows the newest `working_memory`
entries; and whether a person told it to stop.

Durability: the state is a plain JSON value (`snapshot`) that every `ActionCompleted` of the
role carries. A resume that reuses a finished action restores the state from it; a loop
that had not finished runs again from its start, its model and person answers from the
journal and its plan commands run again in order, so it rebuilds the same state. A replay
runs every action again, and so rebuilds it the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence

from engine.load.spec import USER_REQUIREMENT, LlmAction, Sop
from engine.run.message import Message
from engine.run.tools.plan import Plan

__all__ = ["DEFAULT_WORKING_MEMORY", "OLD_OUTPUT_CHARS", "RoleState", "working_memory", "earlier_text", "cut"]


DEFAULT_WORKING_MEMORY = 20
"""Entries shown when neither the action nor the role sets `working_memory`: prompts stay
bounded however long the run (MetaGPT keeps 200 messages, with whole outputs)."""


_MESSAGE_CHARS = 2000
"""A received message as working memory keeps it (the start of it)."""


OLD_OUTPUT_CHARS = 300
"""An earlier step's command output as kept, and as older steps of the current loop are shown."""


_COMMANDS_CHARS = 1000
"""An earlier step's commands as kept (a whole file written is not repeated)."""


def working_memory(spec: Sop, role_id: str, action_id: str) -> int:
    """The entries of earlier work an action's loop shows: the action's, the role's, or 20."""
    action = spec.action_as(action_id, LlmAction)
    role = spec.roles[role_id]
    for window in (action.working_memory, role.working_memory):
        if window is not None:
            return window
    return DEFAULT_WORKING_MEMORY


@dataclass
class RoleState:
    """One role's plan, working memory and stop, across its activations (see the module)."""

    plan: Plan = field(default_factory=Plan)
    entries: list[dict[str, Any]] = field(default_factory=list)
    """Oldest first: `{"kind": "message" | "heard" | "step", ...}` (see `begin`, `record`)."""
    keep: int = 0
    """The most entries kept: the largest window of the role's tool-using actions (0: none)."""
    tools: bool = False
    """Whether the role runs a tool-using action (else nothing is kept, nothing journaled)."""
    turn: int = 0
    """The role's activations so far (the current one's messages are not earlier work)."""
    stopped: str = ""
    """Why the role takes no more turns (a person's `stop`); empty while it works."""
    from_user: bool = False
    """The latest message of the current activation is the user's (RoleZero quick-thinks only then)."""

    @classmethod
    def for_role(cls, spec: Sop, role_id: str) -> RoleState:
        uses = [aid for aid in spec.roles[role_id].runnable_actions()
                if isinstance(spec.actions[aid], LlmAction) and spec.action_as(aid, LlmAction).tools]
        keep = max((working_memory(spec, role_id, aid) for aid in uses), default=0)
        return cls(keep=keep, tools=bool(uses))

    def begin(self, news: Sequence[Message], label: Callable[[str], str], heard: Sequence[Message] = ()) -> None:
        """An activation starts: what the role heard since its last one (`team.public_chat`),
        then the messages that woke it, join its working memory."""
        self.turn += 1
        self.from_user = bool(news) and news[-1].cause_by == USER_REQUIREMENT
        self._add([{"kind": "heard", "turn": self.turn, "round": m.round, "from": label(m.sent_from),
                    "to": ", ".join(label(a) for a in sorted(m.send_to)), "cause_by": m.cause_by,
                    "content": cut(m.content, _MESSAGE_CHARS)} for m in heard] +
                  [{"kind": "message", "turn": self.turn, "round": m.round, "from": label(m.sent_from),
                    "cause_by": m.cause_by, "content": cut(m.content, _MESSAGE_CHARS)} for m in news])

    def record(self, action_id: str, round_: int, steps: Sequence[tuple[list[dict[str, Any]], list[str]]]) -> None:
        """A loop's steps (commands, outputs), once it has ended, join the working memory."""
        self._add([{"kind": "step", "turn": self.turn, "round": round_, "action": action_id, "step": n,
                    "commands": cut(json.dumps(commands, ensure_ascii=False), _COMMANDS_CHARS),
                    "outputs": [cut(o, OLD_OUTPUT_CHARS) for o in outputs]}
                   for n, (commands, outputs) in enumerate(steps, 1)])

    def earlier(self, window: int) -> list[dict[str, Any]]:
        """The newest `window` entries before this activation's own messages (which the
        action's prompt shows itself)."""
        before = [e for e in self.entries if not self._current_message(e)]
        return before[-window:] if window > 0 else []

    def snapshot(self) -> dict[str, Any]:
        """The state as the journal keeps it (in the role's ActionCompleted events)."""
        return {"plan": [dict(t) for t in self.plan.tasks], "memory": list(self.entries),
                "turn": self.turn, "stopped": self.stopped}

    def restore(self, data: dict[str, Any]) -> None:
        """The state a finished action left (resume: the action itself is not run again)."""
        self.plan.tasks = [dict(t) for t in data.get("plan") or []]
        self.entries = [dict(e) for e in data.get("memory") or []]
        self.turn = int(data.get("turn") or 0)
        self.stopped = str(data.get("stopped") or "")

    def _add(self, entries: list[dict[str, Any]]) -> None:
        """Add, then keep the newest `keep` entries of earlier work (this activation's own
        messages besides: they are earlier work from the next activation on), in order."""
        if not (self.tools and self.keep > 0):
            return
        added = self.entries + entries
        earlier = [i for i, e in enumerate(added) if not self._current_message(e)]
        kept = set(earlier[-self.keep:])
        self.entries = [e for i, e in enumerate(added) if i in kept or self._current_message(e)]

    def _current_message(self, entry: dict[str, Any]) -> bool:
        return entry["kind"] == "message" and entry["turn"] == self.turn


def earlier_text(entries: Sequence[dict[str, Any]]) -> str:
    """Earlier work as a loop's prompt shows it, oldest first."""
    blocks = []
    for entry in entries:
        if entry["kind"] == "message":
            blocks.append(f"### Round {entry['round']}: {entry['cause_by']} from {entry['from']}\n"
                          f"{entry['content']}")
        elif entry["kind"] == "heard":
            blocks.append(f"### Round {entry['round']}: {entry['cause_by']} from {entry['from']} to "
                          f"{entry['to']} (heard)\n{entry['content']}")
        else:
            blocks.append(f"### Round {entry['round']}: {entry['action']}, step {entry['step']}\n"
                          f"Commands: {entry['commands']}\n" + "\n".join(entry["outputs"]))
    return "\n\n".join(blocks)


def cut(text: str, limit: int) -> str:
    """The start of `text`, at most `limit` characters, the cut marked."""
    return text if len(text) <= limit else text[:limit] + " [...]"
