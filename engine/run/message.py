"""Messages and addresses: what roles publish and the environment routes (MetaGPT `Message`).

Message ids are deterministic (round, sender, sequence), never random: re-executing a run
with the same answers must give the identical history, and resume/replay depend on that.
Ids are never shown to a model, so they cannot change a request hash either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from collections.abc import Iterable

from engine.load.spec import USER_REQUIREMENT

__all__ = ["ALL", "NONE", "SELF", "HUMAN", "Message", "message_id", "resolve_send_to",
           "content_of", "user_requirement"]


ALL = "<all>"


NONE = "<none>"


SELF = "<self>"


HUMAN = "Human"
"""`sent_from` of the run's first message (the idea)."""


def message_id(round_: int, sender: str, seq: int) -> str:
    """The deterministic id of the `seq`-th message `sender` made in round `round_`."""
    return f"{round_}-{sender}-{seq}"


@dataclass(frozen=True)
class Message:
    """One published or remembered message; `out` is the parsed output (or None)."""

    id: str
    content: str
    cause_by: str
    sent_from: str
    send_to: frozenset[str] = field(default_factory=lambda: frozenset({ALL}))
    round: int = 0
    out: Any = None

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly form (send_to sorted so that the journal's bytes are stable)."""
        return {
            "id": self.id,
            "round": self.round,
            "content": self.content,
            "out": self.out,
            "cause_by": self.cause_by,
            "sent_from": self.sent_from,
            "send_to": sorted(self.send_to),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Message:
        """Rebuild a message recorded by `to_json` (journal, resume)."""
        return cls(
            id=str(data["id"]),
            content=str(data.get("content", "")),
            cause_by=str(data["cause_by"]),
            sent_from=str(data["sent_from"]),
            send_to=frozenset(data.get("send_to") or [ALL]),
            round=int(data.get("round", 0)),
            out=data.get("out"),
        )

    @cached_property
    def quoted(self) -> str:
        """The content as a later prompt's `## Context` quotes it: a structured output whose
        content is its JSON (the default, `content_of`) as its fields (`fields_text`), in the
        order the content has them; anything else as it is. Worked out once per message,
        however many prompts quote it."""
        if not (isinstance(self.out, dict) and self.out and self.content.startswith("{")):
            return self.content
        try:   # the content's own key order (a journal stores `out` with its keys sorted)
            shown = json.loads(self.content)
        except ValueError:
            return self.content
        return fields_text(shown) if shown == self.out else self.content

    def summary(self) -> dict[str, Any]:
        """The contract's history entry: `{id, round, cause_by, sent_from, send_to, chars}`."""
        return {
            "id": self.id,
            "round": self.round,
            "cause_by": self.cause_by,
            "sent_from": self.sent_from,
            "send_to": sorted(self.send_to),
            "chars": len(self.content),
        }

    def template_view(self) -> dict[str, Any]:
        """What templates see (`msgs.X[i]`, `news[i]`): no id, so ids never reach a prompt."""
        return {
            "content": self.content,
            "out": self.out,
            "sent_from": self.sent_from,
            "cause_by": self.cause_by,
            "round": self.round,
        }


def resolve_send_to(send_to: Iterable[str], sender: str) -> frozenset[str]:
    """The sender step: `<self>` becomes the sender's id; an empty list means `<all>`."""
    targets = [sender if t == SELF else t for t in send_to]
    return frozenset(targets) if targets else frozenset({ALL})


def content_of(kind: str, value: Any) -> str:
    """A readable message content for an output: JSON text, or the text itself. A code
    answer is its code alone, without the fence the model wrapped it in (MetaGPT's
    `parse_code`): later prompts and `msgs.X[i].content` see what the artifact holds."""
    if kind == "json" or not isinstance(value, str):
        return json.dumps(value, indent=2, ensure_ascii=False)
    return value


def fields_text(value: dict[str, Any]) -> str:
    """A JSON object as a model reads it with the fewest tokens: one `Key: value` line per
    field; a text of several lines below its key, as written (a mermaid diagram, not an
    escaped JSON string); a list one `- item` line each, an item that is not a one-line text
    as compact JSON (`- ["P0", "Slide tiles"]`); anything else as compact JSON; a field left
    out (null: an optional field the model skipped) not at all. A PRD quoted
    this way is about a tenth shorter than its indented JSON, a design with diagrams more."""
    return "\n".join(_field_text(str(key), item) for key, item in value.items() if item is not None)


def _field_text(key: str, value: Any) -> str:
    if isinstance(value, str):
        return f"{key}:\n{value}" if "\n" in value else f"{key}: {value}".rstrip()
    if isinstance(value, list) and value:
        return f"{key}:\n" + "\n".join(f"- {_item_text(item)}" for item in value)
    return f"{key}: {_compact(value)}"


def _item_text(item: Any) -> str:
    return item if isinstance(item, str) and "\n" not in item else _compact(item)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def user_requirement(idea: str, send_to: Iterable[str] = (ALL,)) -> Message:
    """The run's first message: the idea, from the human, in round 0, to everyone unless
    addressed (`team.send_to`, `--send-to`: MetaGPT's `run_project(idea, send_to=...)`)."""
    return Message(
        id=message_id(0, HUMAN, 0),
        content=idea,
        cause_by=USER_REQUIREMENT,
        sent_from=HUMAN,
        send_to=frozenset(send_to) or frozenset({ALL}),
        round=0,
    )
