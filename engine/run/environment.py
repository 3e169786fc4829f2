"""The environment: where roles publish, and filter 1 of routing (MetaGPT `Environment`).

Every published message goes into the run's history and into the inbox of every role whose
addresses (id and name) meet its `send_to`, or of every role for `<all>`; `<none>` reaches
nobody but is still recorded. With `team.public_chat` every other role hears it as well
(MGX's public chat): it joins their memory, but only the roles it reaches treat it as news;
a message to `<none>` is heard by no one (MGX drops the TeamLeader's). Unlike MetaGPT, a message a role sends to itself also goes
through here, so the history shows every published message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.run.events import MessagePublished, RunEvent
from engine.run.message import ALL, NONE, Message
from engine.run.role import Role

__all__ = ["Environment"]


class Environment:
    """Roles in file order, and the run's history in publish order."""

    def __init__(self, roles: Sequence[Role], emit: Callable[[RunEvent], None], public_chat: bool = False) -> None:
        self.roles = list(roles)
        self.public_chat = public_chat
        self.history: list[Message] = []
        self._emit = emit
        # address -> file position: a message costs its recipients, not every role
        self._by_address: dict[str, int] = {
            address: index for index, role in enumerate(self.roles) for address in role.addresses}

    def recipients(self, message: Message) -> list[Role]:
        """Filter 1: the roles whose addresses meet `send_to` (all for `<all>`), in file order."""
        if ALL in message.send_to:
            return list(self.roles)
        found = {self._by_address[a] for a in message.send_to if a in self._by_address}
        return [self.roles[index] for index in sorted(found)]

    def publish(self, message: Message) -> list[str]:
        """Record the message and deliver it; returns the ids of the roles it reached."""
        self.history.append(message)
        reached = self.recipients(message)
        for role in reached:
            role.deliver(message)
        ids = [role.id for role in reached]
        if self.public_chat and NONE not in message.send_to:   # to no one is heard by no one
            hearing = {*ids, message.sent_from}
            for role in self.roles:
                if role.id not in hearing:
                    role.overhear(message)
        self._emit(MessagePublished(message=message.to_json()))
        return ids

    def active_roles(self) -> list[Role]:
        """The roles that will run this round (not idle), in file order."""
        return [role for role in self.roles if not role.is_idle()]
