"""The answer store of a replay: every answer from the old journal, none from a model."""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from collections.abc import Awaitable
from typing import Any

from engine.errors import JournalError
from engine.journal.store import Journal
from engine.models.types import StoredAnswer

__all__ = ["ReplayStore"]


class ReplayStore:
    """The answer store of a replay: answers come from the old journal, never from a model.

    Every answer used is also copied into the replay's own journal (origin `replay`), so
    that the replay's workspace is itself a complete, replayable run. `record` only happens
    if the gateway called a model, which it must not do in replay mode; it is kept for the
    protocol and stores into the new journal.
    """

    def __init__(self, source: Journal, target: Journal) -> None:
        self.source = source
        self.target = target
        self.misses: list[str] = []
        """Request hashes the run asked for that the old journal lacks (a divergence)."""

    def lookup(self, request_hash: str) -> StoredAnswer | None:
        answer = self.source.lookup(request_hash)
        if answer is None:
            self.misses.append(request_hash)
        else:
            action = self.source.action_of(request_hash) or "?"
            answer = dataclasses.replace(answer, exchange=self._exchange_of(request_hash))
            self.target.record_as(request_hash, action, answer, origin="replay")
        return answer

    def holds(self, request_hash: str) -> bool:
        return self.source.holds(request_hash)

    def record(self, request_hash: str, action: str, answer: StoredAnswer) -> None:
        self.target.record(request_hash, action, answer)

    def durable(self) -> Awaitable[None] | None:
        return self.target.durable()

    def what_changed(self, action: str, messages: list[dict[str, Any]]) -> str:
        """Where a request the journal lacks first differs from the nearest one the action
        made when it was recorded ('' when the journal kept none): what a person needs to see
        of a divergence, not its hash."""
        try:
            recorded = [e.get("messages") or [] for e in self.source.exchanges_of_action(action)]
        except JournalError:
            return ""
        if not recorded:
            return ""
        now = _lines(messages)
        nearest = max(recorded, key=lambda old: difflib.SequenceMatcher(None, _lines(old), now).ratio())
        return _first_difference(action, _lines(nearest), now)

    def _exchange_of(self, request_hash: str) -> dict[str, Any] | None:
        """The prompt to copy with the answer; a damaged one is left out (the answer is what
        a replay needs, the prompt is only for people to read)."""
        try:
            return self.source.exchange(request_hash)
        except JournalError:
            return None


def _lines(messages: list[dict[str, Any]]) -> list[str]:
    """A request's messages as `role: line` lines, to compare line by line."""
    return [f"{m.get('role', '?')}: {line}" for m in messages for line in str(m.get("content", "")).splitlines()]


def _first_difference(action: str, old: list[str], now: list[str]) -> str:
    for index, (was, is_) in enumerate(itertools.zip_longest(old, now, fillvalue="(nothing)")):
        if was != is_:
            return (f"the nearest request {action} made when it was recorded differs first at line {index + 1}:\n"
                    f"  recorded: {_clip(was)}\n  now:      {_clip(is_)}")
    return f"the nearest request {action} made when it was recorded has the same messages (its settings differ)"


def _clip(line: str) -> str:
    return line if len(line) <= 200 else line[:200] + " [...]"
