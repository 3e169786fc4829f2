"""The answer store of a replay: every answer from the old journal, none from a model."""

from __future__ import annotations

import asyncio
import dataclasses
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

    def durable(self) -> asyncio.Future[None] | None:
        return self.target.durable()

    def _exchange_of(self, request_hash: str) -> dict[str, Any] | None:
        """The prompt to copy with the answer; a damaged one is left out (the answer is what
        a replay needs, the prompt is only for people to read)."""
        try:
            return self.source.exchange(request_hash)
        except JournalError:
            return None
