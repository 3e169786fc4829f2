"""A role's memory: the messages it observed or made, in order, indexed by `cause_by`.

As MetaGPT's `Memory`, adding a message twice keeps one copy (dedup by id); the index by
action id is what `msgs.<Action>` in templates and an action's declared `context` read.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.run.message import Message

__all__ = ["Memory"]


class Memory:
    """Ordered storage plus an index by `cause_by`; ids make dedup O(1)."""

    def __init__(self) -> None:
        self._storage: list[Message] = []
        self._ids: set[str] = set()
        self._by_action: dict[str, list[Message]] = {}

    def add(self, message: Message) -> bool:
        """Store a message; False if one with the same id is already stored."""
        if message.id in self._ids:
            return False
        self._storage.append(message)
        self._ids.add(message.id)
        self._by_action.setdefault(message.cause_by, []).append(message)
        return True

    def add_batch(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.add(message)

    def __contains__(self, message: object) -> bool:
        return isinstance(message, Message) and message.id in self._ids

    def __len__(self) -> int:
        return len(self._storage)

    def get(self, k: int = 0) -> list[Message]:
        """Every stored message, oldest first; the last `k` only when k > 0 (MetaGPT's get(k))."""
        return list(self._storage[-k:]) if k > 0 else list(self._storage)

    def try_remember(self, keyword: str) -> list[Message]:
        """MetaGPT's try_remember: the messages whose content holds `keyword` (case-insensitive)."""
        wanted = keyword.lower()
        return [m for m in self._storage if wanted in m.content.lower()]

    def get_by_action(self, action: str) -> list[Message]:
        return list(self._by_action.get(action, ()))

    def get_by_actions(self, actions: Iterable[str]) -> list[Message]:
        """Messages caused by any of `actions`, in storage order."""
        wanted = set(actions)
        return [m for m in self._storage if m.cause_by in wanted]
