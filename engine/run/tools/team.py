"""The `team` toolset: MGX's publish_team_message, a message to one member by name."""

from __future__ import annotations

from engine.load.spec import Sop
from engine.run.tools.base import ToolError

__all__ = ["Team"]


class Team:
    """`team.*` for one role: the messages it sends, in order, as (content, role id)."""

    def __init__(self, spec: Sop, role_id: str) -> None:
        self.spec = spec
        self.messages: list[tuple[str, str]] = []
        self.targets = {name: rid for rid in spec.roles if rid != role_id
                        for name in (rid, spec.role_name(rid))}

    async def do_publish(self, content: str, send_to: str) -> str:
        target = self.targets.get(send_to.strip())
        if target is None:
            raise ToolError(f"no team member '{send_to}'; the members are: "
                            f"{', '.join(dict.fromkeys(self.targets)) or 'none'}")
        if not content.strip():
            raise ToolError("the message is empty")
        self.messages.append((content, target))
        return f"message sent to {self.spec.role_name(target)}"
