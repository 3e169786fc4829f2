"""The environment: where roles publish, and filter 1 of routing (MetaGPT `Environment`).

Every published message goes into the run's history and into the inbox of every role whose
addresses (id and name) meet its `send_to`, or of every role for `<all>`; `<none>` reaches
nobody but is still recorded. Unlike MetaGPT, a message a role sends to itself also goes
through here, so the history shows every published message.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .events import MessagePublished, RunEvent
from .message import Message, is_send_to
from .role import Role

__all__ = ["Environment"]


class Environment:
    """Roles in file order, and the run's history in publish order."""

    def __init__(self, roles: Sequence[Role], emit: Callable[[RunEvent], None]) -> None:
        self.roles = list(roles)
        self.history: list[Message] = []
        self._emit = emit

    def publish(self, message: Message) -> list[str]:
        """Record the message and deliver it; returns the ids of the roles it reached."""
        self.history.append(message)
        reached = []
        for role in self.roles:
            if is_send_to(message.send_to, role.addresses):
                role.deliver(message)
                reached.append(role.id)
        self._emit(MessagePublished(message=message.to_json()))
        return reached

    def active_roles(self) -> list[Role]:
        """The roles that will run this round (not idle), in file order."""
        return [role for role in self.roles if not role.is_idle()]

    def is_idle(self) -> bool:
        return not self.active_roles()
